"""The API server on the wire: routing, LIST and watch streams, writes, discovery and OpenAPI documents,
content negotiation and Table output, bearer-token authentication, and fault injection."""
