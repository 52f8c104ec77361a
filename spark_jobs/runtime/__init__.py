"""What keeps a running stream honest: one driver at a time (``lease``, ``driver``,
``standby``), its checkpoint read and judged (``checkpoint``), its progress recorded
(``progress``, ``history``) and its landing files archived (``archive``). What every part of
the platform shares: state files written whole (``files``) and times in UTC (``clock``)."""
