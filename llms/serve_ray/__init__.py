"""edgellm on Ray Serve (see __main__.py and docs/scale_out.md)."""
