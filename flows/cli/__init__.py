"""`ctrpipe`: the command line (parser and commands), what the terminal shows, exit codes, `ctrpipe evaluate`."""
