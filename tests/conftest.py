import os

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Unit tests keep measured ceilings in memory only: a developer's or a build's cache file is never touched.
os.environ["BOOK_CEILINGS"] = "off"
