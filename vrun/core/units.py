"""Units shared by every figure the project prints or records."""

GIB = 1024 ** 3
