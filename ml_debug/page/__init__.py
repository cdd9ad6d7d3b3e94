"""One self-contained HTML page per incident, and a speedscope export of the merged stacks.

The page is drawn from the same report objects the text views use (``stacks.verdict.DumpStacksResult``,
``logs.result.LogsReport``, the watch bundle's parts): ``shell`` lays out the page, one module per view
draws its section (``stacks``, ``flight``, ``timeline``, ``nodes``), ``text`` is the one place where a
job's strings are escaped for HTML, ``build`` puts a command's page together and writes it, and
``speedscope`` writes the stacks in the file format speedscope and py-spy's users open.
"""
