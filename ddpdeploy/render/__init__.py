"""Pure renderers: JobSpec (through the launch contract) -> objects or text. No network."""
