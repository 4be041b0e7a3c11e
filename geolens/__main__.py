import sys

from geolens.cli import main

if __name__ == "__main__":  # not when a spawned process imports the parent's main module
    sys.exit(main())
