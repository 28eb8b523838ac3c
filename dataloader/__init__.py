"""How batches arrive, in subpackages by concept, each importing only those before it in this
order (each `__init__` says what it owns):

- `util`: the project's low-level utilities (atomic files, locks, compiled-kernel set-up), here
  because dataloader is the lowest package;
- `format`: the dataset on disk, its manifest and parts, torchrec's `.npy` layout, opening a split;
- `spec`: feature specs, what each column of a click log is (the manifest keeps one as data);
- `multihot`: multi-hot ids made from one-hot ids, as MLPerf DLRMv2 makes them;
- `gather`: rows to torchrec batches through compiled gathers;
- `events`: event-log datasets: users' time-sorted events in parts, histories gathered and
  crosses hashed at load time, the order of wall-clock windows.

At the top: the global order and shuffle (order.py), one rank's loader with its resume state
(loader.py; an event-log dataset's temporal loader, event_loader.py), background prefetch
(prefetch.py) and stream digests (digest.py).

Imports: nothing of shardrec (it is the lowest package; every other one may import it).
"""
