"""Reports of fp4moe result files (HDF5 -> Markdown tables and PNG plots; comparison of two runs)."""
