import sys

from mongo_cdc_dev.bench.run import main

sys.exit(main())
