"""Making data: real games played by Dopamine's agents, in Dopamine's files."""
