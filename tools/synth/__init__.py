"""Synthetic click logs with a hidden model, so that learning is measurable: Criteo's text
format (criteo.py), logs shaped like Avazu's and MovieLens-1M's (avazu_movielens.py) and a drifting
log whose ids are born and fade day by day (drift.py).

May import: nothing of shardrec.tools.
"""
