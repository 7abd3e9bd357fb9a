"""Client selectors: the baselines (random, power of choice, DivFL, all, per group) and one
module per paper's selector (UACS-FL, Oort)."""
