"""The simulator: a roofline cost model of a GPU stepping the same schedule."""
