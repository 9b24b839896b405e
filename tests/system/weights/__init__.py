"""Published policy versions and how workers fetch them."""
