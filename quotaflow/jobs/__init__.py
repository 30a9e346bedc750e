"""Jobs: created, read, cancelled, retried and finished in one service; the batch object every
view reports.
"""
