# The controller image, built with no registry: hack/image.sh stages the release
# binary and the shared libraries it links (from this machine) into
# target/image-root, and this file copies that tree onto an empty image.
#
#   hack/image.sh            # builds k3s-control-plane:dev
#
# Runs as a non-root user; the controller needs no filesystem writes.
FROM scratch
COPY target/image-root/ /
USER 65532:65532
ENTRYPOINT ["/k3s-control-plane"]
CMD ["run"]
