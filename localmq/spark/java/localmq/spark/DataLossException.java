package localmq.spark;

/** Messages the read would silently miss (a gap record where damaged ones were) while {@code failOnDataLoss} is on. */
public final class DataLossException extends OffsetRangeException {
    private static final long serialVersionUID = 1L;

    DataLossException(String message) {
        super(message);
    }
}
