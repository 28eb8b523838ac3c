"""Synthetic click logs with a hidden model, so that learning is measurable: Criteo's text
format (criteo.py) and logs shaped like Avazu's and MovieLens-1M's (avazu_movielens.py).

May import: nothing of shardrec.tools.
"""
