"""Client filters: FilFL's greedy filter on a public set."""
