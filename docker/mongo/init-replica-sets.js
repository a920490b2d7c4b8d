// One-shot (service mongo-init-replica-sets): initiates the config server replica set and the two
// shard replica sets. Idempotent: a set that already has a configuration is left as it is.
// Members are named by their compose service names: mongos, Airflow and the CDC tasks resolve them.
const replicaSets = [
  { _id: "cfg", configsvr: true, members: [{ _id: 0, host: "mongo-config:27019" }] },
  { _id: "shard1", members: [{ _id: 0, host: "mongo-shard1:27018" }] },
  { _id: "shard2", members: [{ _id: 0, host: "mongo-shard2:27018" }] },
];

for (const config of replicaSets) {
  const admin = new Mongo(config.members[0].host).getDB("admin");
  if (admin.runCommand({ replSetGetStatus: 1 }).ok) {
    print(`replica set ${config._id} already initiated`);
  } else {
    const reply = admin.runCommand({ replSetInitiate: config });
    if (!reply.ok) {
      throw new Error(`replSetInitiate ${config._id} failed: ${JSON.stringify(reply)}`);
    }
  }
  while (!admin.runCommand({ hello: 1 }).isWritablePrimary) {
    sleep(500);
  }
  print(`replica set ${config._id} has a primary`);
}
