"""Notebook panels (anywidget), installed as ``caravanserai.widgets``.

The Timeline, JournalTable, charts, ForkPanel and Compare panels live here; their JavaScript
ships as files inside the package (no CDN). They import anywidget lazily: the core never does.
"""
