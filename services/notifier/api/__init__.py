"""The notifier's HTTP API: blueprints and their schemas."""
