"""The pieces of the HTTP server below uvicorn (connection guard, listeners, probe listener, limits);
app/server.py composes them and says why they exist."""
