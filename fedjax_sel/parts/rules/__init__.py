"""Participation rules of the selected clients: FedALIGN, FedSRC."""
