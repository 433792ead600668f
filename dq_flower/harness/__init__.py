"""The package's own harness: named tasks, methods, apps, simulate, in-process grid."""
