"""Generated gRPC code for the identity service (package identity.v1)."""
