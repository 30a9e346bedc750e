"""The `quotaflow` command line: talks to the REST API, or runs a file in-process."""
