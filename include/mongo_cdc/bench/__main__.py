import sys

from mongo_cdc.bench.run import main

sys.exit(main())
