"""Talking to SGLang: the HTTP client, the server launcher and the pre-flight checks."""
