"""StarSD's draft inside other serving engines (each integration imports its engine only when it runs there)."""
