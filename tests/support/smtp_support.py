"""A real SMTP server on loopback for the mail tests: it takes every message and keeps it.

Only what a client sending plain mail says (EHLO/HELO, MAIL, RCPT, DATA, RSET, NOOP, QUIT), without
TLS or authentication; Python's own smtpd module is deprecated and gone in 3.12.
"""

from __future__ import annotations

import email
import socketserver
import threading
from email.message import Message


class _Session(socketserver.StreamRequestHandler):
    def reply(self, line: str) -> None:
        self.wfile.write(f"{line}\r\n".encode())

    def handle(self) -> None:
        server: SmtpServer = self.server  # type: ignore[assignment]
        self.reply("220 localhost ESMTP test")
        while line := self.rfile.readline():
            verb = line.decode().strip().split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                self.reply("250 localhost")
            elif verb == "DATA":
                self.reply("354 end with <CRLF>.<CRLF>")
                lines = []
                while (data := self.rfile.readline()) not in (b".\r\n", b""):
                    lines.append(data[1:] if data.startswith(b"..") else data)
                server.messages.append(email.message_from_bytes(b"".join(lines)))
                self.reply("250 queued")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:  # MAIL, RCPT, RSET, NOOP
                self.reply("250 ok")


class SmtpServer(socketserver.ThreadingTCPServer):
    """``messages``: what it received, in order; a context manager that serves in a thread."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Session)
        self.messages: list[Message] = []
        self.port = self.server_address[1]

    def __enter__(self) -> SmtpServer:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
