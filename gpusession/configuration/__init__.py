"""What a session can be asked for: the start-option table, the GPU catalog and prices, the user's
configuration, the backend registry, the metric table, the agent's command line and billed cost."""
