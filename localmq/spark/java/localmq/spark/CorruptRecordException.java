package localmq.spark;

/** A damaged record (bad magic, lengths or body CRC, a torn record) inside a segment read: never a silent skip. */
public final class CorruptRecordException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** Absolute commit log offset of the record. */
    public final long offset;
    /** The segment file. */
    public final String path;

    CorruptRecordException(String message, long offset, String path) {
        super(message);
        this.offset = offset;
        this.path = path;
    }
}
