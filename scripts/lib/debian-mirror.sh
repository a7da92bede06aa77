# Sourced by ci-host-setup.sh and ci-images.sh.
# The first http(s) URI in the machine's apt sources that is not a security mirror.
debian_mirror() {
    { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
          /etc/apt/sources.list.d/*.list 2>/dev/null || true; } | awk '
        /^URIs:/ { uri = $2 }
        /^deb /  { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { uri = $i; break } }
        !found && uri ~ /^https?:/ && uri !~ /security/ { print uri; found = 1 }
        { uri = "" }'
}
