"""What users run, in subpackages by concept, each importing only those before it in this order
(each `__init__` says what it owns):

- `synth`: synthetic click logs (Criteo's format, Avazu- and MovieLens-shaped);
- `preprocess`: raw click logs -> a shardrec dataset, and datasets made from datasets;
- `measure`: measurements of this machine and this data that plans are made from;
- `bench`: the benchmarks, each against someone else's code measured in the same run;
- `cli`: the `shardrec` typer app, one module per command group.

tools/ is last in the import order (dataloader -> embeddings -> sharding -> trainer -> tools):
it may import every other package, and none of them imports it.
"""
