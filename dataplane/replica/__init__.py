"""One partition replica's protocol core: events in, actions out, no I/O."""
