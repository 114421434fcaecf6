"""Shared pytest setup: tests run at the `smoke` size profile unless told otherwise."""
import os

os.environ.setdefault("COURSE_SIZE", "smoke")
