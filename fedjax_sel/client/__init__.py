"""What one client computes: local training, evaluation, chunking, the cost model, the clock."""
