"""The bottom layer: the error tree, the typed data between layers, the protocol between the agent
and the local side, and the grammar of values (durations, money, names, addresses). Standard
library only: the agent imports from here inside users' images."""
