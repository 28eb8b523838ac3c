"""shardrec.embeddings: which embedding tables exist and how they are built, initialised and
optimised.

Owns the table specs read from the dataset manifest (one table per sparse feature, its rows
and its width: the one `model.dims` check), the EmbeddingBagCollection on the meta device, the
names of table weights inside a model, the plan-independent initial weights, and the sparse
optimizer: what is known of each without torch (sparse_optimizers.py: names, state per row and
per weight, the devices that run it; the planner and the config read it), the algorithms and
their settings, fusing them into tables, the optimizer of data-parallel tables (optim.py),
its row-wise state between table layouts (optim_layouts.py), and fbgemm's table batches of a
sharded model with the step counters their optimizers keep outside any state dict
(table_batches.py). The `managed` subpackage holds the tables of raw-id features whose rows an
id map hands out while training runs.

May import: shardrec.dataloader only (for the manifest).
"""
