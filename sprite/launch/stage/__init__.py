"""``sprite run --stage``: the Python environment the ranks import from, packed once into one archive on the
shared file system (cached by a fingerprint of its files), broadcast to every node once, unpacked into a
node-local folder, and the ranks started from that copy.

``source`` says what is staged, ``archive`` writes and safely reads the archive (stdlib tarfile), ``node`` is the
per-node tool (claim the folder, unpack, remove), ``plan`` the pure part of the launch plan, ``run`` the effects.
"""
