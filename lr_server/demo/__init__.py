"""``lr demo``: sites replicating on embedded SQLite, as real ``lr server`` processes.

:mod:`~lr_server.demo.star` is the default demo (``a`` replicates to ``b``,
``c`` and ``d``), :mod:`~lr_server.demo.tree` the cascaded one
(``--topology tree``), :mod:`~lr_server.demo.sites` what both share. Only the
``lr demo`` command imports them; the late site's Spark full sync is in
:mod:`spark_jobs.demo`.
"""
