"""``python -m trainer.prepare_data``: see trainer/prepare_data/__init__.py."""

import sys

from trainer.prepare_data.cli import main

if __name__ == "__main__":
    sys.exit(main())
