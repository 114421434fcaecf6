"""``python -m course_grade``: the same as the ``course-grade`` command."""

import sys

from .cli import main

sys.exit(main())
