import sys

from geolens.cli import main

sys.exit(main())
