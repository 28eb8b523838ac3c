"""What users run: the CLI (`tools.cli`), preprocessing (`tools.preprocess`), the benchmarks
(`tools.bench`) and synthetic data (`tools.synth`).

tools/ is last in the import order (dataloader -> embeddings -> sharding -> trainer -> tools):
it may import every other package, and none of them imports it.
"""
