"""What a write must look like: OpenAPI schemas compiled for pruning, typing and defaults, ObjectMeta rules,
and the CEL subset of CRD validation rules."""
