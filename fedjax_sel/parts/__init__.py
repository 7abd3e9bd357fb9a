"""The parts of a round: pure functions over client-state arrays (types, availability,
selectors, filters, participation rules, aggregators, server optimizers)."""
