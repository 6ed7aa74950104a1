import sys

from fedsl.bench.command import main

sys.exit(main())
