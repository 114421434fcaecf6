"""course_utils."""
