"""Sessions: the append-only session files (:mod:`.store`), writing them as a chat happens
(:mod:`.writer`) and exporting them (:mod:`.export`)."""
