"""The portal: web pages for a tenant's developers and support staff, on the JSON APIs."""
