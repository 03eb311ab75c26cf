import sys

from stare.app.cli import main

sys.exit(main())
