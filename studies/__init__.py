"""What researchers run: validated study specs, study entry points, statistics, reports and the CLI."""
