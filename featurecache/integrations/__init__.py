"""Bridges to other AlphaFold3-family tools; imported only by their users, never by featurecache's core."""
