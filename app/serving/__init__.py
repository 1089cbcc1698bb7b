"""The process's HTTP server: uvicorn behind a connection guard, with a probe-only listener, TLS with
certificate reload, the SIGTERM hand-over, and the process's log format. ``server.py`` composes the pieces
and says why they exist."""
