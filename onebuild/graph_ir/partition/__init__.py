"""Graph partitioning: backend assignment (manual maps, minimum cost) and region splitting."""
