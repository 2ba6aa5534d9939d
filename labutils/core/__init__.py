"""Layer 1, the bottom: start ranks, describe the machine, time things, record spans and measure
memory. Imports nothing else from labutils."""
